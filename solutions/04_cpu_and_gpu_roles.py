"""Solutions of the exercises in notebooks/04_cpu_and_gpu_roles.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
need = train_images_per_s[str(dev) if dev.type != "cpu" else "cpu"]  # images/s the step takes
enough_workers = min((w for w, v in loader_images_per_s.items() if v >= need), default=None)
check("04.1", enough_workers);
