"""Solutions to the exercises of notebooks/09_profiler_and_memory.ipynb (shown there by helpers.course.solution).

Each section runs in the notebook's namespace and ends with the exercise's own check.
"""
# %% exercise 1
inputs_share = (1.2 + 0.4) / sum(exercise_phases.values())  # 17 %: below 20 %, so not input-bound
busy_share = 2.3 / (2.1 + 3.9 + 1.6)                           # 30 %: below 50 %, the GPU mostly waits for the host
answer_bound = "overhead"
check("09.1", answer_bound)

# %% exercise 2
batch_16gib = int((16384 - fixed_mb) / per_image_mb)  # memory left after the fixed part, per image, rounded down
check("09.2", batch_16gib)
