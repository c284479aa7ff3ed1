"""Solutions of the exercises in notebooks/02_cpu_vs_gpu_timing.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
cpu32 = matmul_results["cpu"]["fp32"]  # GFLOP/s by size
half_size = min(s for s, g in cpu32.items() if g >= 0.5 * max(cpu32.values()))
check("02.1", half_size);
