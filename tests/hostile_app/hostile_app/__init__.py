"""A test Flower app: mmfl-flwr's apps, with one SuperNode hostile on request."""
