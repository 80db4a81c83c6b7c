"""The dashboard at ``GET /``: server-rendered pages (``routes``), what they show (``views``)."""
