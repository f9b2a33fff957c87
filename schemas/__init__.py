"""The Avro schemas of jobreg events (installed as ``registry.schemas``)."""
