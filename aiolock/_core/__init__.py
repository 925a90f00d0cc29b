"""The engine below the primitives: connections, listener, watchdog, scripts, holds."""
