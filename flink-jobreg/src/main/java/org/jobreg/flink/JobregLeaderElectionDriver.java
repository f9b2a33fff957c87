/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.annotation.VisibleForTesting;
import org.apache.flink.runtime.leaderelection.LeaderElectionDriver;
import org.apache.flink.runtime.leaderelection.LeaderElectionException;
import org.apache.flink.runtime.leaderelection.LeaderInformation;
import org.apache.flink.util.concurrent.ExecutorThreadFactory;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.HashSet;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * {@link LeaderElectionDriver} over jobreg's election, through the process's {@link
 * JobregBridge}: one term of jobreg's fenced log is one Flink leadership.
 *
 * <ul>
 *   <li>Grants and revocations strictly alternate. The leader session id is the bridge's {@code
 *       session}, a UUID derived from (namespace, epoch), so a reader of the log can map Flink's
 *       session back to jobreg's epoch.
 *   <li>{@link #hasLeadership()} is true only while a grant holds <em>and</em> the last lease
 *       confirmation is still valid on this JVM's monotonic clock. A JVM resumed after a pause
 *       (SIGSTOP, a long GC) past its lease knows at once that it may no longer lead, before the
 *       bridge's revocation is read. A watchdog revokes locally when the lease runs out, or when it
 *       itself was stalled for half a lease (events read after such a stall may be stale), and
 *       then withdraws and contends again.
 *   <li>A non-leader never publishes: {@link #publishLeaderInformation} returns without a write
 *       unless this driver leads, and the bridge fences the write by the session as well.
 *   <li>Changes of the published components' leader information reach the listener (while
 *       leading), so Flink's service can correct drift; failures reach {@code onError}.
 * </ul>
 */
public class JobregLeaderElectionDriver
        implements LeaderElectionDriver, JobregBridge.EventListener {

    private static final Logger LOG = LoggerFactory.getLogger(JobregLeaderElectionDriver.class);

    private final JobregBridge bridge;
    private final Listener listener;
    private final long leaseNanos;
    private final ScheduledExecutorService watchdog;

    /**
     * Calls the listener, one call at a time, in the order the state changed. Never call the
     * listener while holding {@link #lock}: Flink's DefaultLeaderElectionService calls {@link
     * #hasLeadership()} under its own lock, so calling it back under ours could deadlock.
     */
    private final java.util.concurrent.ExecutorService notifier;

    private final Object lock = new Object();
    private final Set<String> watchedComponents = new HashSet<>();

    private boolean running = true;
    private boolean granted;
    private long epoch = -1;
    private UUID session;
    private long leaseDeadlineNanos;
    private long leaseDeadlineWallMillis = Long.MAX_VALUE;
    private volatile long lastTickNanos = System.nanoTime();

    public JobregLeaderElectionDriver(JobregBridge bridge, Listener listener) throws Exception {
        this.bridge = bridge;
        this.listener = listener;
        this.leaseNanos = bridge.getLease().toNanos();
        this.watchdog =
                Executors.newSingleThreadScheduledExecutor(
                        new ExecutorThreadFactory("jobreg-leader-watchdog"));
        this.notifier =
                Executors.newSingleThreadExecutor(
                        new ExecutorThreadFactory("jobreg-leader-notifier"));
        bridge.addListener(this);
        long tick = Math.max(10, bridge.getLease().toMillis() / 10);
        watchdog.scheduleAtFixedRate(this::tick, tick, tick, TimeUnit.MILLISECONDS);
        bridge.call(JobregBridge.request("contend"));
    }

    // ------------------------------------------------------------------------------------------
    // LeaderElectionDriver
    // ------------------------------------------------------------------------------------------

    @Override
    public boolean hasLeadership() {
        synchronized (lock) {
            return holdsValidLease(System.nanoTime());
        }
    }

    private boolean holdsValidLease(long now) {
        return running
                && granted
                && now - leaseDeadlineNanos < 0
                && System.currentTimeMillis() < leaseDeadlineWallMillis
                && now - lastTickNanos < leaseNanos / 2;
    }

    /**
     * Takes the lease a {@code granted} or {@code lease} line states (under {@link #lock}): valid
     * for {@code valid_for_ms} from its receipt, but never past the absolute deadlines the bridge
     * computed when it read the lease, so a line that was delayed on its way (a full pipe, the
     * bridge descheduled or stopped) does not extend the belief by the delay: {@code
     * deadline_mono_ns} on CLOCK_MONOTONIC, which {@link System#nanoTime()} reads on the same
     * host, and {@code deadline_wall_ms} on the wall clock, which counts a suspend of the host
     * (CLOCK_MONOTONIC does not). A bridge that sends neither is taken at its word.
     */
    private void takeLease(JsonNode event) {
        long[] deadlines = leaseDeadlines(event, System.nanoTime());
        leaseDeadlineNanos = deadlines[0];
        leaseDeadlineWallMillis = deadlines[1];
    }

    /**
     * The lease's end as a line received at {@code receivedNanos} states it: {@code
     * [System.nanoTime() deadline, wall-clock deadline in ms]} ({@link Long#MAX_VALUE} when the
     * line has no wall-clock deadline).
     */
    @VisibleForTesting
    static long[] leaseDeadlines(JsonNode event, long receivedNanos) {
        long deadline =
                receivedNanos + TimeUnit.MILLISECONDS.toNanos(event.path("valid_for_ms").asLong());
        if (event.hasNonNull("deadline_mono_ns")) {
            long stated = event.path("deadline_mono_ns").asLong();
            if (stated - deadline < 0) {
                deadline = stated;
            }
        }
        long wall =
                event.hasNonNull("deadline_wall_ms")
                        ? event.path("deadline_wall_ms").asLong()
                        : Long.MAX_VALUE;
        return new long[] {deadline, wall};
    }

    /** The current leader session id, or null when this driver does not lead. */
    @VisibleForTesting
    UUID currentSession() {
        synchronized (lock) {
            return granted ? session : null;
        }
    }

    @Override
    public void publishLeaderInformation(String componentId, LeaderInformation leaderInformation) {
        UUID sessionToWrite;
        long epochToWrite;
        synchronized (lock) {
            if (!holdsValidLease(System.nanoTime())) {
                LOG.debug(
                        "Not publishing {} for {}: this process does not lead.",
                        leaderInformation,
                        componentId);
                return;
            }
            sessionToWrite =
                    leaderInformation.isEmpty() ? session : leaderInformation.getLeaderSessionID();
            epochToWrite = epoch;
        }
        ensureWatched(componentId);
        ObjectNode request = JobregBridge.request("publish");
        request.put("component", componentId);
        request.put("session", sessionToWrite.toString());
        if (leaderInformation.isEmpty()) {
            request.putNull("address");
        } else {
            request.put("address", leaderInformation.getLeaderAddress());
        }
        try {
            bridge.call(request);
            LOG.debug("Published {} for {}.", leaderInformation, componentId);
        } catch (JobregBridgeException e) {
            if (e.isNotLeader()) {
                LOG.info("jobreg refused to publish for {}: {}", componentId, e.getMessage());
                revokeLocally(epochToWrite, "publish refused: " + e.getMessage());
            } else if (e.isOutcomeUnknown()
                    || JobregBridgeException.UNAVAILABLE.equals(e.getKind())) {
                // The watch shows what is there; Flink's service publishes again on drift.
                LOG.warn("Publishing for {} may have failed: {}", componentId, e.getMessage());
            } else {
                LeaderElectionException error =
                        new LeaderElectionException(
                                "Could not publish the leader information for " + componentId, e);
                notifyListener(() -> listener.onError(error));
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    @Override
    public void deleteLeaderInformation(String componentId) {
        publishLeaderInformation(componentId, LeaderInformation.empty());
    }

    private void ensureWatched(String componentId) {
        synchronized (lock) {
            if (!watchedComponents.add(componentId)) {
                return;
            }
        }
        try {
            bridge.watch(componentId);
        } catch (JobregBridgeException e) {
            synchronized (lock) {
                watchedComponents.remove(componentId);
            }
            LOG.warn("Cannot watch the leader information of {}: {}", componentId, e.getMessage());
        }
    }

    @Override
    public void close() throws Exception {
        Set<String> components;
        synchronized (lock) {
            if (!running) {
                return;
            }
            running = false;
            granted = false;
            components = new HashSet<>(watchedComponents);
            watchedComponents.clear();
        }
        watchdog.shutdownNow();
        notifier.shutdown();
        bridge.removeListener(this);
        for (String component : components) {
            bridge.unwatch(component);
        }
        if (!bridge.closedFuture().isDone()) {
            try {
                bridge.call(JobregBridge.request("withdraw"));
            } catch (JobregBridgeException e) {
                LOG.info("Withdrawing from jobreg's election failed: {}", e.getMessage());
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Bridge events
    // ------------------------------------------------------------------------------------------

    @Override
    public void onEvent(JsonNode event) {
        String kind = event.path("event").asText("");
        switch (kind) {
            case "granted":
                onGranted(event);
                break;
            case "lease":
                onLease(event);
                break;
            case "revoked":
                onRevoked(event);
                break;
            case "leader":
                onLeader(event);
                break;
            case "error":
                LeaderElectionException error =
                        new LeaderElectionException(
                                "jobreg bridge: " + event.path("message").asText(""));
                notifyListener(() -> listener.onError(error));
                break;
            default:
                break;
        }
    }

    private void onGranted(JsonNode event) {
        long newEpoch = event.path("epoch").asLong();
        UUID newSession = UUID.fromString(event.path("session").asText());
        synchronized (lock) {
            if (!running) {
                return;
            }
            if (granted) {
                // Strict alternation: end the old term for Flink before the new one starts.
                LOG.warn("jobreg granted epoch {} while epoch {} was held", newEpoch, epoch);
                granted = false;
                notifyListener(listener::onRevokeLeadership);
            }
            granted = true;
            epoch = newEpoch;
            session = newSession;
            takeLease(event);
            LOG.info("jobreg granted leadership: epoch {}, session {}.", epoch, session);
            UUID grantedSession = session;
            notifyListener(() -> listener.onGrantLeadership(grantedSession));
        }
    }

    private void onLease(JsonNode event) {
        long leaseEpoch = event.path("epoch").asLong();
        synchronized (lock) {
            if (granted && leaseEpoch == epoch) {
                takeLease(event);
            }
        }
    }

    private void onRevoked(JsonNode event) {
        long revokedEpoch = event.path("epoch").asLong();
        synchronized (lock) {
            if (!granted || revokedEpoch != epoch) {
                return;
            }
            granted = false;
            LOG.info(
                    "jobreg revoked leadership: epoch {} ({}).",
                    revokedEpoch,
                    event.path("reason").asText(""));
            notifyListener(listener::onRevokeLeadership);
        }
    }

    private void onLeader(JsonNode event) {
        String component = event.path("component").asText();
        LeaderInformation information = JobregLeaderRetrievalDriver.toLeaderInformation(event);
        synchronized (lock) {
            if (!running || !granted || !watchedComponents.contains(component)) {
                return;
            }
            notifyListener(() -> listener.onLeaderInformationChange(component, information));
        }
    }

    @Override
    public void onBridgeClosed(Throwable cause) {
        synchronized (lock) {
            if (!running) {
                return;
            }
            if (granted) {
                granted = false;
                notifyListener(listener::onRevokeLeadership);
            }
            Throwable error =
                    cause != null
                            ? cause
                            : new LeaderElectionException("the jobreg bridge has ended");
            notifyListener(() -> listener.onError(error));
        }
    }

    private void notifyListener(Runnable call) {
        try {
            notifier.execute(call);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            LOG.debug("The driver is closed; not telling the listener", e);
        }
    }

    // ------------------------------------------------------------------------------------------
    // The watchdog
    // ------------------------------------------------------------------------------------------

    private void tick() {
        long now = System.nanoTime();
        long gap = now - lastTickNanos;
        String reason = null;
        long expiredEpoch;
        synchronized (lock) {
            if (granted && running) {
                if (gap >= leaseNanos / 2) {
                    reason =
                            "this JVM was stalled for "
                                    + TimeUnit.NANOSECONDS.toMillis(gap)
                                    + " ms (half the lease is "
                                    + TimeUnit.NANOSECONDS.toMillis(leaseNanos / 2)
                                    + " ms)";
                } else if (now - leaseDeadlineNanos >= 0
                        || System.currentTimeMillis() >= leaseDeadlineWallMillis) {
                    reason = "the lease ran out before jobreg confirmed it";
                }
            }
            expiredEpoch = epoch;
            lastTickNanos = now;
        }
        if (reason != null) {
            revokeLocally(expiredEpoch, reason);
        }
    }

    /**
     * Ends the term for Flink at once, then withdraws (so the bridge gives up the term it may still
     * hold) and contends again.
     */
    private void revokeLocally(long expiredEpoch, String reason) {
        synchronized (lock) {
            if (!running || !granted || epoch != expiredEpoch) {
                return;
            }
            granted = false;
            LOG.warn("Leadership of epoch {} ends here: {}.", expiredEpoch, reason);
            notifyListener(listener::onRevokeLeadership);
        }
        bridge.callAsync(JobregBridge.request("withdraw"))
                .handle(
                        (ignored, error) -> {
                            synchronized (lock) {
                                if (!running) {
                                    return null;
                                }
                            }
                            bridge.callAsync(JobregBridge.request("contend"))
                                    .exceptionally(
                                            e -> {
                                                notifyListener(() -> listener.onError(e));
                                                return null;
                                            });
                            return null;
                        });
    }
}
