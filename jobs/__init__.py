"""The top layer: sources, Spark jobs and the command line. The only layer importing pyspark."""
