"""Solutions of the exercises in notebooks/01_categorical_labels_on_the_gpu.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
try:
    encoder.encode(["3", "10"])
except UnseenLabelError as err:
    message = str(err)  # the encoder's own words: the unseen label and the classes it knows
check("01.1", message);


# %% exercise 2
seed_everything(seed)
lstm = SequenceClassifier(12, len(encoder), hidden=hidden, bidirectional=False)
fit(lstm, train_loader, epochs=epochs, optimizer=torch.optim.Adam(lstm.parameters(), lr=0.01), device=dev,
    host_inputs=(1,), grad_clip=1.0, progress=False)
lstm_accuracy = evaluate(lstm, test_loader, dev, host_inputs=(1,))["accuracy"]
check("01.2", lstm_accuracy)
print(f"LSTM: {lstm_accuracy:.4f}, BiLSTM: {test_accuracy:.4f}")
