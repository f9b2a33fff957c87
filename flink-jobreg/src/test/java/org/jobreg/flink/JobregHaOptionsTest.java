/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.HighAvailabilityOptions;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The bridge's command line from Flink's configuration (issue 43, item 7: its metrics). */
class JobregHaOptionsTest {

    private static Configuration configuration() {
        Configuration configuration = new Configuration();
        configuration.set(JobregHaOptions.BOOTSTRAP, "127.0.0.1:9092");
        configuration.set(HighAvailabilityOptions.HA_CLUSTER_ID, "/prod/cluster 1");
        return configuration;
    }

    @Test
    void testNoMetricsAreServedUnlessAPortIsNamed() {
        List<String> command = JobregHaOptions.bridgeCommand(configuration(), "jm-1");

        assertThat(command).contains("flink-bridge", "--namespace", "prod-cluster-1");
        assertThat(command).doesNotContain("--metrics-port", "--metrics-host");
    }

    @Test
    void testAPortRangeAndAHostReachTheBridge() {
        Configuration configuration = configuration();
        configuration.set(JobregHaOptions.METRICS_PORT, " 9464-9470 ");
        configuration.set(JobregHaOptions.METRICS_HOST, "0.0.0.0");

        List<String> command = JobregHaOptions.bridgeCommand(configuration, "jm-1");

        int at = command.indexOf("--metrics-port");
        assertThat(at).isPositive();
        assertThat(command.subList(at, at + 4))
                .containsExactly("--metrics-port", "9464-9470", "--metrics-host", "0.0.0.0");
    }
}
