"""The lock family, each over the engine of ``aiolock._core``."""
