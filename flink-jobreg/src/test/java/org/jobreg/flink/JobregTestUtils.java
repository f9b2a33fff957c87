/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.DeploymentOptions;
import org.apache.flink.configuration.HighAvailabilityOptions;
import org.apache.flink.runtime.leaderelection.LeaderElectionEvent;
import org.apache.flink.runtime.leaderelection.TestingLeaderElectionListener;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.UUID;

/** Configurations, bridges and leaders for the tests. */
public final class JobregTestUtils {

    /** The lease the tests use: short, so takeovers are quick, but generous for a busy machine. */
    public static final Duration TEST_LEASE = Duration.ofSeconds(4);

    private JobregTestUtils() {}

    /** A fresh namespace: each test sees an empty registry. */
    public static String freshClusterId() {
        return "flink-test-" + UUID.randomUUID().toString().substring(0, 12);
    }

    /** A configuration of high availability on jobreg for the broker and a storage folder. */
    public static Configuration configuration(String bootstrap, String clusterId, Path storageDir) {
        Configuration configuration = new Configuration();
        configuration.set(HighAvailabilityOptions.HA_MODE, JobregHaServicesFactory.class.getName());
        configuration.set(HighAvailabilityOptions.HA_CLUSTER_ID, clusterId);
        configuration.set(HighAvailabilityOptions.HA_STORAGE_PATH, storageDir.toUri().toString());
        configuration.set(JobregHaOptions.BOOTSTRAP, bootstrap);
        configuration.set(JobregHaOptions.COMMAND, JobregBrokerExtension.jobregCommand());
        configuration.set(JobregHaOptions.LEASE, TEST_LEASE);
        configuration.set(
                DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS,
                List.of(JobregJobStatusChangedListenerFactory.class.getName()));
        // What JobregHaServicesFactory adds where it can (a MiniCluster's is unmodifiable).
        configuration.setString(
                "events.reporter.jobreg.factory.class",
                JobregJobStatusEventReporterFactory.class.getName());
        configuration.setString("events.reporter.jobreg.namespace", clusterId);
        return configuration;
    }

    /** A bridge whose process leads: a driver over it has been granted leadership. */
    public static final class Leader implements AutoCloseable {
        public final JobregBridge bridge;
        public final JobregLeaderElectionDriver driver;
        public final TestingLeaderElectionListener listener;
        public final UUID session;

        private Leader(
                JobregBridge bridge,
                JobregLeaderElectionDriver driver,
                TestingLeaderElectionListener listener,
                UUID session) {
            this.bridge = bridge;
            this.driver = driver;
            this.listener = listener;
            this.session = session;
        }

        @Override
        public void close() throws Exception {
            try {
                driver.close();
            } finally {
                bridge.close();
            }
        }
    }

    /**
     * Submits a job to jobreg as Flink's execution plan store would (an entry of {@code plans}):
     * jobreg counts and keeps checkpoints of known jobs only.
     */
    public static void submitJob(JobregBridge bridge, JobID jobId) throws Exception {
        ObjectNode request = JobregBridge.request("store_add");
        request.put("store", JobregHaServices.PLANS);
        request.put("name", jobId.toHexString());
        request.put("pointer", "test://plan/" + jobId.toHexString());
        bridge.call(request);
    }

    /** Starts a bridge, contends and waits until it leads. */
    public static Leader startLeader(Configuration configuration) throws Exception {
        JobregBridge bridge = JobregBridge.start(configuration);
        try {
            TestingLeaderElectionListener listener = new TestingLeaderElectionListener();
            JobregLeaderElectionDriver driver = new JobregLeaderElectionDriver(bridge, listener);
            UUID session =
                    listener.await(LeaderElectionEvent.IsLeaderEvent.class).getLeaderSessionID();
            return new Leader(bridge, driver, listener, session);
        } catch (Exception e) {
            bridge.close();
            throw e;
        }
    }

    /** Sleeps 2 ms a record: keeps a sequence source from using a whole core. */
    public static final class Throttle implements MapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public Long map(Long value) throws Exception {
            Thread.sleep(2);
            return value;
        }
    }
}
