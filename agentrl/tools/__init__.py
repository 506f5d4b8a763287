"""Tool use: typed tools and tool envs, tool-call parsing and native call formats, and the code sandbox."""
