/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.Configuration;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/** The bridge process's life, apart from what it answers. */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobregBridgeITCase {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    @TempDir Path storageDir;

    /**
     * The bridge sets Linux's PR_SET_PDEATHSIG so it never outlives its JVM, but Linux sends that
     * signal when the thread that started the child ends, not the process. Flink builds its
     * high-availability services on whatever thread it likes (a pool thread that may be retired
     * later): the bridge must outlive that thread, or the JobManager loses its leadership then.
     */
    @Test
    void testBridgeOutlivesTheThreadThatStartedIt() throws Exception {
        Configuration configuration =
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir);
        CompletableFuture<JobregBridge> started = new CompletableFuture<>();
        Thread starter =
                new Thread(
                        () -> {
                            try {
                                started.complete(JobregBridge.start(configuration));
                            } catch (Throwable t) {
                                started.completeExceptionally(t);
                            }
                        },
                        "short-lived-starter");
        starter.start();
        JobregBridge bridge = started.get(60, TimeUnit.SECONDS);
        starter.join();
        try {
            // The death signal, if it came, came when the starter ended; give it time to land.
            Thread.sleep(1000);
            assertThat(ProcessHandle.of(bridge.pid()).map(ProcessHandle::isAlive))
                    .as("the bridge process after the thread that started it ended")
                    .contains(true);
            assertThat(bridge.call(JobregBridge.request("leaders")).isObject()).isTrue();
        } finally {
            bridge.close();
        }
    }
}
