"""The vocabulary of corral: records, statuses, resources and errors. Imports nothing else of corral."""
