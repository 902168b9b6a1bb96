"""Ring records into meaning: events, values, kernel names, graphs, communicators, devices,
stacks."""
