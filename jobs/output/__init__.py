"""Where published data goes: the output formats, Spark writing into staging, the files a
write task stages, the commit built from them and the output's owner record."""
