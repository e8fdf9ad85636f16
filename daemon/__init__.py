"""The p2ptrain node service: lifecycle, signals, sd_notify, HTTP API, logging setup."""
