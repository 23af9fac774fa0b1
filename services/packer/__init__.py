"""The packer service: the stream packing buffer that turns ready groups into micro-steps."""
