"""`python -m bench chaos`: kill each kind of kvstack process in turn under a steady load and count
what every request became (docs/reliability.md)."""
