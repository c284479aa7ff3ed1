"""Solutions of the exercises in notebooks/03_transfer_overhead.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
best = max(bandwidth["H2D pinned" if cuda else "host→host copy"].values())  # GB/s
copy_us = 256 * 3 * 32 * 32 * 4 / (best * 1e9) * 1e6
check("03.1", copy_us);
print(f"{copy_us:.1f} µs")
