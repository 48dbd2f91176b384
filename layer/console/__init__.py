"""The web console's static files (``static/``: plain HTML, JavaScript and CSS, no build step),
served by ``layer.coordinator.console``."""
