"""qlayer: message-queue semantics (AMPS-style queues) on Apache Kafka."""
