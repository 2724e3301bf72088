"""What a run is asked to do: its settings as given and as resolved (device, precision, budget,
data path), where its data comes from, its learning-rate schedule, and which errors are the
user's."""
