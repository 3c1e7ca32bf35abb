"""The collector: ingest node reports, keep rank tables, detect stalls, export."""
