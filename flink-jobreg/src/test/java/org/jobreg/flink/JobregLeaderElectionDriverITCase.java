/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.leaderelection.LeaderElectionEvent;
import org.apache.flink.runtime.leaderelection.LeaderInformation;
import org.apache.flink.runtime.leaderelection.TestingLeaderElectionListener;
import org.apache.flink.runtime.leaderretrieval.TestingLeaderRetrievalEventHandler;
import org.apache.flink.runtime.util.TestingFatalErrorHandler;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The scenarios of Flink's {@code ZooKeeperLeaderElectionDriverTest} (and {@code
 * KubernetesLeaderElectionDriverTest}), ported to {@link JobregLeaderElectionDriver} and {@link
 * JobregLeaderRetrievalDriver} over real bridges and a real broker, plus what jobreg adds: the
 * session is jobreg's epoch, and a leader whose lease runs out (a paused bridge) knows by its own
 * clock before anyone else can lead.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobregLeaderElectionDriverITCase {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    private static final Duration TIMEOUT = Duration.ofSeconds(60);

    @TempDir Path storageDir;

    private Configuration configuration;
    private final List<AutoCloseable> resources = new ArrayList<>();

    @BeforeEach
    void setUp() {
        configuration =
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir);
    }

    @AfterEach
    void tearDown() throws Exception {
        for (int i = resources.size() - 1; i >= 0; i--) {
            try {
                resources.get(i).close();
            } catch (Exception e) {
                // Already closed or dead: the test killed it.
            }
        }
        resources.clear();
    }

    /** A contender: its own bridge (as one JobManager process) and a driver. */
    private final class Contender implements AutoCloseable {
        final JobregBridge bridge;
        final TestingLeaderElectionListener listener = new TestingLeaderElectionListener();
        final JobregLeaderElectionDriver driver;
        boolean closed;

        Contender() throws Exception {
            bridge = JobregBridge.start(configuration);
            resources.add(bridge);
            driver = new JobregLeaderElectionDriver(bridge, listener);
            resources.add(this);
        }

        UUID awaitGrant() throws InterruptedException {
            return listener.await(LeaderElectionEvent.IsLeaderEvent.class).getLeaderSessionID();
        }

        @Override
        public void close() throws Exception {
            if (!closed) {
                closed = true;
                try {
                    driver.close();
                } finally {
                    bridge.close();
                }
            }
        }
    }

    private TestingLeaderRetrievalEventHandler retrieve(String component) throws Exception {
        JobregBridge bridge = JobregBridge.start(configuration);
        resources.add(bridge);
        TestingLeaderRetrievalEventHandler handler = new TestingLeaderRetrievalEventHandler();
        JobregLeaderRetrievalDriver driver =
                new JobregLeaderRetrievalDriver(
                        bridge, component, handler, new TestingFatalErrorHandler());
        resources.add(driver);
        return handler;
    }

    /** Waits until the handler's newest information is {@code expected}. */
    private static void awaitLeader(
            TestingLeaderRetrievalEventHandler handler, LeaderInformation expected)
            throws Exception {
        long deadline = System.nanoTime() + TIMEOUT.toNanos();
        while (!expected.equals(handler.getLeader())) {
            assertThat(System.nanoTime() - deadline)
                    .as("retrieval saw %s, not %s", handler.getLeader(), expected)
                    .isNegative();
            if (expected.isEmpty()) {
                handler.waitForEmptyLeaderInformation();
            } else {
                handler.waitForNewLeader();
            }
        }
    }

    @Test
    void testLeadershipIsGrantedWithTheEpochsSession() throws Exception {
        Contender contender = new Contender();
        UUID session = contender.awaitGrant();

        assertThat(contender.driver.hasLeadership()).isTrue();
        assertThat(contender.driver.currentSession()).isEqualTo(session);
        // The session is derived from (namespace, epoch): the audit maps Flink's id to jobreg's.
        assertThat(session.version()).isEqualTo(5);
    }

    @Test
    void testPublishIsSeenByRetrieval() throws Exception {
        Contender leader = new Contender();
        UUID session = leader.awaitGrant();
        TestingLeaderRetrievalEventHandler handler = retrieve("dispatcher");

        LeaderInformation information = LeaderInformation.known(session, "pekko://leader/d");
        leader.driver.publishLeaderInformation("dispatcher", information);

        awaitLeader(handler, information);
    }

    @Test
    void testPublishingEmptyLeaderInformationClears() throws Exception {
        Contender leader = new Contender();
        UUID session = leader.awaitGrant();
        TestingLeaderRetrievalEventHandler handler = retrieve("resource_manager");
        LeaderInformation information = LeaderInformation.known(session, "pekko://leader/rm");
        leader.driver.publishLeaderInformation("resource_manager", information);
        awaitLeader(handler, information);

        leader.driver.deleteLeaderInformation("resource_manager");

        awaitLeader(handler, LeaderInformation.empty());
    }

    @Test
    void testLeaderIsToldOfItsComponentsLeaderInformation() throws Exception {
        Contender leader = new Contender();
        UUID session = leader.awaitGrant();
        LeaderInformation information = LeaderInformation.known(session, "pekko://leader/rest");

        leader.driver.publishLeaderInformation("rest_server", information);

        long deadline = System.nanoTime() + TIMEOUT.toNanos();
        while (true) {
            LeaderElectionEvent.LeaderInformationChangeEvent event =
                    leader.listener.await(LeaderElectionEvent.LeaderInformationChangeEvent.class);
            assertThat(event.getComponentId()).isEqualTo("rest_server");
            if (event.getLeaderInformation().equals(information)) {
                break;
            }
            assertThat(System.nanoTime() - deadline).isNegative();
        }
    }

    @Test
    void testNonLeaderNeverPublishes() throws Exception {
        Contender leader = new Contender();
        UUID session = leader.awaitGrant();
        Contender follower = new Contender();
        TestingLeaderRetrievalEventHandler handler = retrieve("dispatcher");
        LeaderInformation leaders = LeaderInformation.known(session, "pekko://leader/d");
        leader.driver.publishLeaderInformation("dispatcher", leaders);
        awaitLeader(handler, leaders);

        assertThat(follower.driver.hasLeadership()).isFalse();
        // The driver does not even try ...
        follower.driver.publishLeaderInformation(
                "dispatcher", LeaderInformation.known(UUID.randomUUID(), "pekko://follower/d"));
        follower.driver.deleteLeaderInformation("dispatcher");
        // ... and the bridge refuses a write of a process without a term, even with the
        // leader's session.
        ObjectNode publish = JobregBridge.request("publish");
        publish.put("component", "dispatcher");
        publish.put("session", session.toString());
        publish.put("address", "pekko://follower/d");
        assertThatThrownBy(() -> follower.bridge.call(publish))
                .isInstanceOfSatisfying(
                        JobregBridgeException.class,
                        e -> assertThat(e.isNotLeader()).isTrue());

        // What the leader published stands (a later leader event would show a change).
        ObjectNode leadersRequest = JobregBridge.request("leaders");
        assertThat(
                        follower.bridge
                                .call(leadersRequest)
                                .path("dispatcher")
                                .path("address")
                                .asText())
                .isEqualTo("pekko://leader/d");
        assertThat(handler.getLeader()).isEqualTo(leaders);
    }

    @Test
    void testExactlyOneOfNDriversLeadsAsLeadersCloseInTurn() throws Exception {
        List<Contender> contenders = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            contenders.add(new Contender());
        }
        List<UUID> sessions = new ArrayList<>();
        while (!contenders.isEmpty()) {
            Contender leader = awaitTheOneLeader(contenders);
            sessions.add(leader.driver.currentSession());
            leader.close();
            contenders.remove(leader);
        }
        assertThat(sessions).doesNotHaveDuplicates().hasSize(3);
    }

    /** Polls until one contender leads; never sees two at once. */
    private Contender awaitTheOneLeader(List<Contender> contenders) throws InterruptedException {
        long deadline = System.nanoTime() + TIMEOUT.toNanos();
        while (true) {
            List<Contender> leading =
                    contenders.stream()
                            .filter(c -> c.driver.hasLeadership())
                            .collect(Collectors.toList());
            assertThat(leading).as("leaders at once").hasSizeLessThanOrEqualTo(1);
            if (leading.size() == 1) {
                return leading.get(0);
            }
            assertThat(System.nanoTime() - deadline).as("nobody leads").isNegative();
            Thread.sleep(20);
        }
    }

    @Test
    void testBridgeDeathRevokesLeadershipAndIsAnError() throws Exception {
        Contender leader = new Contender();
        leader.awaitGrant();

        ProcessHandle.of(leader.bridge.pid()).ifPresent(ProcessHandle::destroyForcibly);

        leader.listener.await(LeaderElectionEvent.NotLeaderEvent.class);
        leader.listener.await(LeaderElectionEvent.ErrorEvent.class);
        assertThat(leader.driver.hasLeadership()).isFalse();
    }

    /**
     * Seed 000's long pause, on the bridge's side: a leader whose bridge is stopped (SIGSTOP) gets
     * no lease confirmations; its driver revokes by the local clock, and by then it no longer
     * claims leadership when the standby is granted.
     */
    @Test
    void testPausedLeaderKnowsItLostBeforeTheStandbyLeads() throws Exception {
        Contender leader = new Contender();
        leader.awaitGrant();
        Contender standby = new Contender();

        signal(leader.bridge.pid(), "STOP");
        try {
            leader.listener.await(LeaderElectionEvent.NotLeaderEvent.class);
            assertThat(leader.driver.hasLeadership()).isFalse();
            standby.awaitGrant();
            assertThat(leader.driver.hasLeadership()).isFalse();
        } finally {
            signal(leader.bridge.pid(), "CONT");
        }
        // Resumed, it may contend again but cannot lead while the standby's term holds.
        assertThat(standby.driver.hasLeadership() && leader.driver.hasLeadership()).isFalse();
    }

    private static void signal(long pid, String signal) throws Exception {
        Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(pid)).start();
        assertThat(kill.waitFor()).isZero();
    }
}
