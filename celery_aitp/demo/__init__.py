"""The demo: an embedded broker, three kinds of workers and a mixed multi-tenant load."""
