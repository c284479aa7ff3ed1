"""Solutions of the exercises in notebooks/00_getting_started.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
ms_double = 8 * measured["cpu"].median_s * 1e3  # 2·(2n)³ = 8 × 2·n³ operations at the same rate
check("00.1", ms_double);
