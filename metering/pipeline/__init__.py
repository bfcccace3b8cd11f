"""Events through the broker: the message format (`messages`), the queue and task names
(`routing`), the embedded broker's switch (`transport`), emitting (`producer`) and
applying a batch (`batches`). Imports nothing, so `import metering.pipeline.producer`
loads no database."""
