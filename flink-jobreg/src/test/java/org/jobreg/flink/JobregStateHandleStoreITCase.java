/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.Path;
import org.apache.flink.runtime.leaderelection.LeaderElectionEvent;
import org.apache.flink.runtime.leaderelection.TestingLeaderElectionListener;
import org.apache.flink.runtime.persistence.IntegerResourceVersion;
import org.apache.flink.runtime.persistence.StateHandleStore;
import org.apache.flink.runtime.persistence.filesystem.FileSystemStateStorageHelper;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.io.File;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * A port of Flink's {@code KubernetesStateHandleStoreITCase} to {@link JobregStateHandleStore}:
 * N stores in N processes (bridges) of one namespace, each contending; only the leader's writes
 * stick, the others' are refused and their files discarded. Plus the behaviour Flink's {@code
 * DefaultExecutionPlanStore} relies on (there is no abstract StateHandleStore contract test), and
 * seed 000 for stores: a leader paused past its lease is refused after it resumes.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobregStateHandleStoreITCase {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    private static final int NUM_STORES = 3;

    @TempDir java.nio.file.Path storageDir;

    private Configuration configuration;
    private final List<Process> processes = new ArrayList<>();

    /** One JobManager-like process: a bridge, a driver, a store over {@code plans}. */
    private final class Member implements AutoCloseable {
        final JobregBridge bridge;
        final TestingLeaderElectionListener listener = new TestingLeaderElectionListener();
        final JobregLeaderElectionDriver driver;
        final JobregStateHandleStore<String> store;

        Member() throws Exception {
            bridge = JobregBridge.start(configuration);
            driver = new JobregLeaderElectionDriver(bridge, listener);
            store =
                    new JobregStateHandleStore<>(
                            bridge,
                            JobregHaServices.PLANS,
                            new FileSystemStateStorageHelper<>(
                                    new Path(storageDir.toUri()), "test-state"));
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

    private final List<Member> members = new ArrayList<>();

    @BeforeEach
    void setUp() {
        configuration =
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir);
    }

    @AfterEach
    void tearDown() throws Exception {
        for (Member member : members) {
            try {
                signal(member.bridge.pid(), "CONT");
            } catch (Exception ignored) {
                // It has ended.
            }
            member.close();
        }
        members.clear();
    }

    private Member awaitLeader() throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (System.nanoTime() < deadline) {
            for (Member member : members) {
                if (member.driver.hasLeadership()) {
                    return member;
                }
            }
            Thread.sleep(20);
        }
        throw new AssertionError("nobody leads");
    }

    private long stateFiles() {
        File[] files = storageDir.toFile().listFiles((dir, name) -> name.startsWith("test-state"));
        return files == null ? 0 : files.length;
    }

    @Test
    void testOnlyTheLeaderCouldAddAndLock() throws Exception {
        for (int i = 0; i < NUM_STORES; i++) {
            members.add(new Member());
        }
        Member leader = awaitLeader();
        String[] names = new String[NUM_STORES];
        for (int i = 0; i < NUM_STORES; i++) {
            names[i] = new JobID().toHexString();
            Member member = members.get(i);
            if (member == leader) {
                member.store.addAndLock(names[i], "state of " + i);
            } else {
                int index = i;
                assertThatThrownBy(() -> member.store.addAndLock(names[index], "state of " + index))
                        .hasMessageContaining("not the leader");
            }
        }
        int leaderIndex = members.indexOf(leader);

        for (Member member : members) {
            assertThat(member.store.getAllHandles()).containsExactly(names[leaderIndex]);
            assertThat(member.store.getAndLock(names[leaderIndex]).retrieveState())
                    .isEqualTo("state of " + leaderIndex);
        }
        // The refused writes' files are gone; the leader's stays.
        assertThat(stateFiles()).isEqualTo(1);
    }

    @Test
    void testANewLeaderTakesOverTheEntries() throws Exception {
        for (int i = 0; i < NUM_STORES; i++) {
            members.add(new Member());
        }
        Member first = awaitLeader();
        String name = new JobID().toHexString();
        first.store.addAndLock(name, "first");
        first.close();
        members.remove(first);

        Member second = awaitLeader();
        assertThat(second).isNotSameAs(first);
        assertThat(second.store.getAndLock(name).retrieveState()).isEqualTo("first");
        String other = new JobID().toHexString();
        second.store.addAndLock(other, "second");
        assertThat(second.store.getAllHandles()).containsExactlyInAnyOrder(name, other);
    }

    /** Seed 000 for stores: a leader paused past its lease is refused once it resumes. */
    @Test
    void testPausedLeadersWriteIsRefusedAfterItResumes() throws Exception {
        members.add(new Member());
        Member stale = awaitLeader();
        members.add(new Member());

        signal(stale.bridge.pid(), "STOP");
        stale.listener.await(LeaderElectionEvent.NotLeaderEvent.class);
        Member successor = members.get(1);
        successor.listener.await(LeaderElectionEvent.IsLeaderEvent.class);
        signal(stale.bridge.pid(), "CONT");

        String name = new JobID().toHexString();
        assertThatThrownBy(() -> stale.store.addAndLock(name, "stale"))
                .hasMessageContaining("not the leader");
        assertThat(successor.store.exists(name).isExisting()).isFalse();
        assertThat(stateFiles()).isZero();
        successor.store.addAndLock(name, "fresh");
        assertThat(stale.store.getAndLock(name).retrieveState()).isEqualTo("fresh");
    }

    /** What DefaultExecutionPlanStore relies on, on one leader's store. */
    @Test
    void testStoreBehaviour() throws Exception {
        members.add(new Member());
        StateHandleStore<String, IntegerResourceVersion> store = awaitLeader().store;
        String name = new JobID().toHexString();

        assertThat(store.exists(name).isExisting()).isFalse();
        assertThatThrownBy(() -> store.getAndLock(name))
                .isInstanceOf(StateHandleStore.NotExistException.class);
        store.addAndLock(name, "one");
        IntegerResourceVersion version = store.exists(name);
        assertThat(version.isExisting()).isTrue();
        assertThatThrownBy(() -> store.addAndLock(name, "again"))
                .isInstanceOf(StateHandleStore.AlreadyExistException.class);
        // jobreg has no event that replaces a job's graph: refused, and the new file discarded.
        assertThatThrownBy(() -> store.replace(name, version, "two"))
                .isInstanceOf(UnsupportedOperationException.class);
        assertThat(store.getAllAndLock())
                .singleElement()
                .satisfies(
                        entry -> {
                            assertThat(entry.f1).isEqualTo(name);
                            assertThat(entry.f0.retrieveState()).isEqualTo("one");
                        });
        assertThat(stateFiles()).isEqualTo(1);

        assertThat(store.releaseAndTryRemove(name)).isTrue();
        assertThat(store.getAllHandles()).isEmpty();
        assertThat(stateFiles()).isZero();
        // Removing what is not there is fine.
        assertThat(store.releaseAndTryRemove(name)).isTrue();
        store.release(name);
        store.releaseAll();
        assertThat(Objects.requireNonNull(store.getAllHandles())).isEmpty();
    }

    private static void signal(long pid, String signal) throws Exception {
        Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(pid)).start();
        kill.waitFor();
    }
}
