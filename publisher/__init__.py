"""Write ahead, execute, recover."""
