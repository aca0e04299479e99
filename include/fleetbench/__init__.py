"""fleetbench: benchmark fleets of GPU hosts with Apache Airflow."""

__version__ = "0.1.0"
