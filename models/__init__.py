"""OCR engines behind one interface (``models.engine.Engine``); one module per technology."""
