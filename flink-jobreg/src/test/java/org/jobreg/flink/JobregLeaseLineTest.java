/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.junit.jupiter.api.Test;

import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * How the driver takes a {@code granted} or {@code lease} line's lease (issue 42, the eleventh
 * read's B1 and B2): counted from the line's receipt, but never past the absolute deadlines the
 * bridge computed when it read the lease, so a line held on its way (a full pipe, a stopped
 * bridge) does not extend the belief by the delay, and a suspend of the host (which {@link
 * System#nanoTime()} does not count) ends it by the wall clock.
 */
class JobregLeaseLineTest {

    private static final ObjectMapper JSON = new ObjectMapper();

    private static ObjectNode line(long validForMs) {
        ObjectNode line = JSON.createObjectNode();
        line.put("event", "lease").put("epoch", 1).put("valid_for_ms", validForMs);
        return line;
    }

    @Test
    void testALineOfAnOlderBridgeIsTakenAtItsWord() {
        long received = 1_000_000_000L;
        long[] deadlines = JobregLeaderElectionDriver.leaseDeadlines(line(1800), received);

        assertThat(deadlines[0]).isEqualTo(received + TimeUnit.MILLISECONDS.toNanos(1800));
        assertThat(deadlines[1]).isEqualTo(Long.MAX_VALUE);
    }

    @Test
    void testALineHeldOnItsWayEndsAtTheBridgesDeadline() {
        long computed = 5_000_000_000L; // the bridge read the lease here ...
        ObjectNode line = line(1800).put("deadline_mono_ns", computed + 1_800_000_000L);
        line.put("deadline_wall_ms", 1_700_000_001_800L);
        long received = computed + 1_500_000_000L; // ... and the JVM read the line 1.5 s later

        long[] deadlines = JobregLeaderElectionDriver.leaseDeadlines(line, received);

        assertThat(deadlines[0]).isEqualTo(computed + 1_800_000_000L); // 0.3 s left, not 1.8
        assertThat(deadlines[1]).isEqualTo(1_700_000_001_800L);
    }

    @Test
    void testALineAlreadyPastItsDeadlineGivesNoLease() {
        long received = 9_000_000_000L;
        ObjectNode line = line(1800).put("deadline_mono_ns", received - 1);

        assertThat(JobregLeaderElectionDriver.leaseDeadlines(line, received)[0] - received)
                .isNegative();
    }

    @Test
    void testALaterDeadlineThanTheLinesOwnCountIsNotTaken() {
        long received = 2_000_000_000L;
        ObjectNode line = line(1000).put("deadline_mono_ns", received + 60_000_000_000L);

        assertThat(JobregLeaderElectionDriver.leaseDeadlines(line, received)[0])
                .isEqualTo(received + 1_000_000_000L);
    }
}
