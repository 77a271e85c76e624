"""The Gradio page's logic, kept out of app.py: presets, settings, per-session state, runs and views."""
