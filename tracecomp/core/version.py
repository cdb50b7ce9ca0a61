"""tracecomp's version, held once: the package root re-exports it, and the stages that
write it into what they store (the compile cache's key, exported libraries' metadata)
import it from here instead of from the package root above them.  pyproject.toml names
it too, for the packagers."""
__version__ = "0.1.0"
