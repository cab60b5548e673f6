"""Benchmarks that print figures side by side with RabbitMQ; never timed asserts."""
