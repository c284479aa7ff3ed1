"""Solutions of the exercises in notebooks/03_transfer_overhead.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
copy_us = 256 * 3 * 32 * 32 * 4 / (best * 1e9) * 1e6
check(copy_us, expected_us, rel_tol=0.02);
print(f"{copy_us:.1f} µs")
