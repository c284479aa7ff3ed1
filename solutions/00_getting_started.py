"""Solutions of the exercises in notebooks/00_getting_started.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
my_gflops = 2 * n**3 / measured["cpu"].median_s / 1e9
check("00.1", my_gflops);
