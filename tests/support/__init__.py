"""What the tests share: the model of Kafka's cleaner and of clients (:mod:`.model`),
random histories over it (:mod:`.histories`), the incident set-ups several tests replay
(:mod:`.incidents`), the throwaway PostgreSQL (:mod:`.pg`) and SparkSession
(:mod:`.sparkfixture`) fixtures, the TLS proxy and certificates (:mod:`.tls`), the SASL proxy
(:mod:`.sasl_proxy`), both on one loopback relay (:mod:`.relay`), crash injection
(:mod:`.crashing`, ``crash/``) and the processes tests start (``procs/``)."""
