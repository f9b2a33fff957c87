/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.HighAvailabilityOptions;
import org.apache.flink.configuration.IllegalConfigurationException;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/** The configuration options of Flink's high availability on jobreg. */
public final class JobregHaOptions {

    /** The Kafka bootstrap servers of the jobreg log (required). */
    public static final ConfigOption<String> BOOTSTRAP =
            ConfigOptions.key("high-availability.jobreg.bootstrap")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "host:port[,host:port...] of the Kafka brokers that hold"
                                    + " jobreg's log.");

    /**
     * The command that runs jobreg (split on whitespace), e.g. {@code jobreg} or {@code
     * /opt/venv/bin/python -m registry}; {@code flink-bridge} and its arguments are appended.
     */
    public static final ConfigOption<String> COMMAND =
            ConfigOptions.key("high-availability.jobreg.command")
                    .stringType()
                    .defaultValue("jobreg")
                    .withDescription(
                            "The command that runs jobreg, split on whitespace; the backend"
                                    + " appends 'flink-bridge' and its arguments.");

    /** How long a leadership term lasts without renewal. */
    public static final ConfigOption<Duration> LEASE =
            ConfigOptions.key("high-availability.jobreg.lease")
                    .durationType()
                    .defaultValue(Duration.ofSeconds(5))
                    .withDescription(
                            "The lease of a leadership term: a JobManager that cannot renew it for "
                                    + "this long (including a paused JVM) is no longer leader.");

    /** librdkafka properties for the bridge (SASL, TLS), as jobreg's other commands take them. */
    public static final ConfigOption<String> COMMAND_CONFIG =
            ConfigOptions.key("high-availability.jobreg.command-config")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "A file of librdkafka properties passed to the bridge"
                                    + " (--command-config).");

    /** Where the bridge serves jobreg's Prometheus metrics: a port, or a range for several. */
    public static final ConfigOption<String> METRICS_PORT =
            ConfigOptions.key("high-availability.jobreg.metrics-port")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "The port, or a range such as 9464-9470 (the first free one is"
                                    + " taken: several JobManagers on one host), on which the"
                                    + " bridge serves jobreg's Prometheus metrics at /metrics"
                                    + " (leadership, writes and their latency, refusals by"
                                    + " reason). Not set: none are served.");

    /** The address the bridge's metrics are served on. */
    public static final ConfigOption<String> METRICS_HOST =
            ConfigOptions.key("high-availability.jobreg.metrics-host")
                    .stringType()
                    .defaultValue("127.0.0.1")
                    .withDescription("The address the bridge's metrics are served on.");

    private JobregHaOptions() {}

    /** The bridge's namespace: Flink's cluster id, sanitized as the bridge protocol says. */
    public static String namespace(Configuration configuration) {
        return sanitizeNamespace(configuration.get(HighAvailabilityOptions.HA_CLUSTER_ID));
    }

    /**
     * Drops leading slashes and replaces every character outside {@code [A-Za-z0-9._-]} by
     * {@code -}.
     */
    public static String sanitizeNamespace(String clusterId) {
        String name = clusterId.replaceFirst("^/+", "");
        name = name.replaceAll("[^A-Za-z0-9._-]", "-");
        if (name.isEmpty()) {
            throw new IllegalConfigurationException(
                    "high-availability.cluster-id '" + clusterId + "' gives an empty namespace");
        }
        return name;
    }

    /** The bootstrap servers; a clear error when the key is missing. */
    public static String bootstrap(Configuration configuration) {
        String bootstrap = configuration.get(BOOTSTRAP);
        if (bootstrap == null || bootstrap.isBlank()) {
            throw new IllegalConfigurationException(
                    "jobreg high availability needs " + BOOTSTRAP.key() + " (host:port)");
        }
        return bootstrap.trim();
    }

    /** Checks that {@code high-availability.storageDir} is set (payloads live there). */
    public static void checkStorageDir(Configuration configuration) {
        String dir = configuration.get(HighAvailabilityOptions.HA_STORAGE_PATH);
        if (dir == null || dir.isBlank()) {
            throw new IllegalConfigurationException(
                    "jobreg high availability needs "
                            + HighAvailabilityOptions.HA_STORAGE_PATH.key()
                            + " (execution plans and checkpoint metadata are stored there)");
        }
    }

    /** The full bridge command line for one contender. */
    public static List<String> bridgeCommand(Configuration configuration, String contender) {
        List<String> command =
                new ArrayList<>(Arrays.asList(configuration.get(COMMAND).trim().split("\\s+")));
        command.add("flink-bridge");
        command.add("--bootstrap");
        command.add(bootstrap(configuration));
        command.add("--namespace");
        command.add(namespace(configuration));
        command.add("--contender");
        command.add(contender);
        command.add("--lease");
        command.add(Double.toString(configuration.get(LEASE).toMillis() / 1000.0));
        String commandConfig = configuration.get(COMMAND_CONFIG);
        if (commandConfig != null && !commandConfig.isBlank()) {
            command.add("--command-config");
            command.add(commandConfig);
        }
        String metricsPort = configuration.get(METRICS_PORT);
        if (metricsPort != null && !metricsPort.isBlank()) {
            command.add("--metrics-port");
            command.add(metricsPort.trim());
            command.add("--metrics-host");
            command.add(configuration.get(METRICS_HOST));
        }
        return command;
    }
}
