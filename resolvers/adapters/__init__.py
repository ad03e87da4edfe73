"""Beside the plumbing: the media tools (ffmpeg, Pillow), the transcriber, the event
broker and the routes that serve local media."""
