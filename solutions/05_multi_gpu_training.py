"""Solutions of the exercises in notebooks/05_multi_gpu_training.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
lr_8 = 0.1 * (8 * 256) / 256
check("05.1", lr_8);


# %% exercise 2
ddp_main([str(a) for a in small_args + ["--no-bn", "--batch-size", 16, "--params-out", work / "one16.pt"]])
launch(2, small_args + ["--no-bn", "--batch-size", 8, "--params-out", work / "two8.pt"], device="cpu", echo=False)
diff_small = max_param_diff(torch.load(work / "one16.pt", weights_only=True),
                            torch.load(work / "two8.pt", weights_only=True))
check("05.2", diff_small);
