"""Solutions of the exercises in notebooks/07_learning_rate_schedules.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.1)
for epoch in range(55):
    opt.step()
    sched.step()
lr_epoch_55 = opt.param_groups[0]["lr"]
check("07.1", lr_epoch_55);
