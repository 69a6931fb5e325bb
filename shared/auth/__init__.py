"""Credentials of the control bus (NATS users and permissions) and of the data plane."""
