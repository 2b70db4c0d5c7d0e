"""`cmt doctor`: checks the platform cmt runs on and says, per line, what is wrong and how to fix it."""
