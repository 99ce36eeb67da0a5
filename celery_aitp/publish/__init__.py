"""The publish path: hook -> pipeline stages -> decision. Never touches the network."""
