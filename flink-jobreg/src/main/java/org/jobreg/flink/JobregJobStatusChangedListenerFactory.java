/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.DeploymentOptions;
import org.apache.flink.core.execution.JobExecutionStatusEvent;
import org.apache.flink.core.execution.JobStatusChangedEvent;
import org.apache.flink.core.execution.JobStatusChangedListener;
import org.apache.flink.core.execution.JobStatusChangedListenerFactory;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;

/**
 * Records a job's end in jobreg at the moment Flink's execution graph decides it (seed 001's
 * window): a user's cancel when the graph enters CANCELLING, any other end when it reaches a
 * globally terminal status; never the end of an execution graph the adaptive scheduler replaces
 * (issue 42, finding 4).
 *
 * <p>Flink 2.3's {@code DefaultExecutionGraph.transitionState} sets the new status, logs "switched
 * from state X to Y", then calls the {@link JobStatusChangedListener}s of {@code
 * execution.job-status-changed-listeners} synchronously on the JobMaster's main thread, and only
 * afterwards completes the graph's termination future, from which the JobMaster tells the
 * Dispatcher, which then writes its dirty job result. The checkpoint services' shutdown with the
 * terminal status runs even later (when the scheduler closes, after the Dispatcher's write). So
 * this listener is the earliest point at which the registry can learn that a job ended. {@link
 * JobregHaServicesFactory} adds it to the JobManager's configuration where that configuration can
 * be changed (the standalone entrypoints); set {@code execution.job-status-changed-listeners:
 * org.jobreg.flink.JobregJobStatusChangedListenerFactory} to be sure.
 *
 * <p><b>A user's cancel is recorded at CANCELLING, as CANCELED.</b> Recorded at CANCELED, the
 * record (~19 ms through the bridge) came after Flink's "CANCELLING to CANCELED" line, and a
 * JobManager killed 2-8 ms after that line still had its job run again by the next leader.
 * Recorded at CANCELLING, synchronously: the later transition to CANCELED runs on the same main
 * thread after this listener returned, so no one can observe CANCELED (log line, REST,
 * Dispatcher) before the record is in the log.
 *
 * <p><b>An execution graph is not the job.</b> The default scheduler keeps one graph for the
 * job's life (its restarts are RUNNING to RESTARTING and back); the adaptive scheduler (also in
 * reactive mode) replaces its graph on every restart: its {@code Restarting} state cancels the
 * graph (RUNNING to CANCELLING to CANCELED) and then builds a new one. Who calls {@code
 * DefaultExecutionGraph.cancel()}, the only way into CANCELLING, in Flink 2.3.0's {@code
 * flink-runtime} ({@code javap -c -p}): {@code SchedulerBase.cancel()} (the default and adaptive
 * batch schedulers' cancel: a user's, or cancel-with-savepoint's), {@code
 * adaptive.Canceling.<init>} (the adaptive scheduler's cancel, from Executing, Failing,
 * StopWithSavepoint or Restarting) and {@code adaptive.Restarting.<init>} (a restart: a task
 * failure, a TaskManager lost, a rescale). The transition runs synchronously inside that call, so
 * the listener reads the caller from its own stack ({@link #cancelledToRestart()}): a CANCELLING
 * under {@code Restarting} is a replaced graph, recorded as nothing, and the graph's later
 * CANCELED is skipped too ({@code Restarting.onGloballyTerminalState} accepts only CANCELED and
 * moves on to a new graph). Flink creates the listeners per graph ({@code
 * DefaultExecutionGraphBuilder.buildGraph}), so that mark is per graph.
 *
 * <p>Why a user's cancel is irrevocable once the graph is CANCELLING:
 *
 * <ul>
 *   <li>{@code DefaultExecutionGraph.transitionState(current, new)} is a compare-and-set on the
 *       current status, on the main thread. The only transitions out of CANCELLING: {@code
 *       allVerticesInTerminalState()} CANCELLING to CANCELED (the normal end); the cancel
 *       future's failure handler ({@code lambda$cancel$4}) CANCELLING to FAILED ("Could not
 *       cancel job"); {@code failJob} (a failure the scheduler cannot restart) CANCELLING to
 *       FAILING, whose completion ({@code lambda$failJob$8}) ends FAILED, or CANCELED if the
 *       graph is CANCELLING again; {@code suspend} (leadership lost, the JobMaster closing) to
 *       SUSPENDED. {@code cancel()} itself moves only RUNNING, CREATED, RESTARTING and FAILING to
 *       CANCELLING.
 *   <li>The default scheduler's restarts do not pass through CANCELLING ({@code
 *       addVerticesToRestartPending}, {@code removeVerticesFromRestartPending}, both
 *       compare-and-set, so no-ops while CANCELLING); and {@code SchedulerBase.cancel()}
 *       increments every vertex's version before it cancels the graph, which discards restarts
 *       already pending.
 *   <li>The {@code AdaptiveScheduler}'s {@code Canceling} state ignores {@code cancel()} and
 *       every failure ({@code onFailure} does nothing: no restart), and goes to {@code Finished}
 *       on the globally terminal status; a lost leadership ends it SUSPENDED, as every state with
 *       an execution graph.
 * </ul>
 *
 * <p>So a CANCELLING job ends CANCELED, FAILED (a cancel that itself failed: jobreg keeps
 * CANCELLED, the first record, and the Dispatcher's FAILED result finds a result there), or
 * SUSPENDED when leadership is lost, where the next leader must not run it again: the record
 * makes the cancel hold. The globally terminal statuses (FINISHED, FAILED, and CANCELED again,
 * idempotent) of a graph that is not replaced are still recorded when reached.
 *
 * <p>Not seen here: a user's cancel while the adaptive scheduler is {@code Restarting}. Its
 * graph is already CANCELLING or CANCELED (marked replaced); {@code Restarting.cancel()} moves to
 * {@code Canceling} with that graph, whose {@code cancel()} is then a no-op, so no transition
 * tells this listener. {@link JobregJobStatusEventReporterFactory} records that cancel from the
 * scheduler's own job status (CANCELLING when it enters {@code Canceling}).
 */
public class JobregJobStatusChangedListenerFactory implements JobStatusChangedListenerFactory {

    private static final Logger LOG =
            LoggerFactory.getLogger(JobregJobStatusChangedListenerFactory.class);

    /** Flink instantiates the factory reflectively. */
    public JobregJobStatusChangedListenerFactory() {}

    @Override
    public JobStatusChangedListener createListener(Context context) {
        String namespace = JobregHaOptions.namespace(context.getConfiguration());
        return new Listener(namespace);
    }

    /** Adds this factory to {@code execution.job-status-changed-listeners} unless it is there. */
    static void register(Configuration configuration) {
        List<String> listeners = configuration.get(DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS);
        String name = JobregJobStatusChangedListenerFactory.class.getName();
        if (listeners != null && listeners.contains(name)) {
            return;
        }
        List<String> updated = listeners == null ? new ArrayList<>() : new ArrayList<>(listeners);
        updated.add(name);
        try {
            configuration.set(DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS, updated);
        } catch (UnsupportedOperationException e) {
            // MiniCluster hands out an unmodifiable configuration.
            LOG.warn(
                    "Cannot add {} to {} (the configuration is unmodifiable): set it there, or a"
                            + " JobManager killed right after a job ended may run it again.",
                    name,
                    DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS.key());
            return;
        }
        LOG.info(
                "Added {} to {}: jobreg records a job's end as its execution graph reaches it.",
                name,
                DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS.key());
    }

    /** The adaptive scheduler's state that cancels a graph to replace it (2.3.0). */
    static final String ADAPTIVE_RESTARTING =
            "org.apache.flink.runtime.scheduler.adaptive.Restarting";

    /** The adaptive scheduler's state of a user's cancel (2.3.0). */
    static final String ADAPTIVE_CANCELING = "org.apache.flink.runtime.scheduler.adaptive.Canceling";

    /** The default (and adaptive batch) scheduler's cancel, a user's (2.3.0). */
    static final String SCHEDULER_BASE = "org.apache.flink.runtime.scheduler.SchedulerBase";

    /**
     * Whether the execution graph is entering CANCELLING because the adaptive scheduler's {@code
     * Restarting} state cancels it to replace it, read from the calling thread's stack: the
     * transition runs synchronously inside {@code DefaultExecutionGraph.cancel()}, whose only
     * callers in Flink 2.3.0 are {@code Restarting.<init>} (a restart: a task failure, a lost
     * TaskManager, a rescale), {@code Canceling.<init>} (the adaptive scheduler's cancel) and
     * {@code SchedulerBase.cancel()} (the default scheduler's cancel, and cancel-with-savepoint).
     * The innermost of these frames decides; with none of them (a caller this class does not
     * know, or a test calling the listener) the CANCELLING is taken for a cancel, as before.
     */
    static boolean cancelledToRestart() {
        return StackWalker.getInstance()
                .walk(
                        frames ->
                                frames.map(StackWalker.StackFrame::getClassName)
                                        .filter(
                                                name ->
                                                        name.equals(ADAPTIVE_RESTARTING)
                                                                || name.equals(ADAPTIVE_CANCELING)
                                                                || name.equals(SCHEDULER_BASE))
                                        .findFirst())
                .map(ADAPTIVE_RESTARTING::equals)
                .orElse(false);
    }

    /**
     * One per execution graph: Flink 2.3.0's {@code DefaultExecutionGraphBuilder.buildGraph}
     * creates the listeners ({@code JobStatusChangedListenerUtils}) for each graph it builds, and
     * the adaptive scheduler builds one per restart. So {@link #replaced} is this graph's.
     */
    private static final class Listener implements JobStatusChangedListener {

        private final String namespace;

        /**
         * This graph entered CANCELLING for the adaptive scheduler's restart: its CANCELED (or
         * the FAILED of a cancel that failed) is not the job's end; the job continues in a new
         * graph. A graph never leaves CANCELLING for a running status, so this is never reset
         * within a graph; it is reset at CREATED or RUNNING should a listener ever be shared.
         */
        private boolean replaced;

        Listener(String namespace) {
            this.namespace = namespace;
        }

        @Override
        public void onEvent(JobStatusChangedEvent event) {
            if (!(event instanceof JobExecutionStatusEvent)) {
                return;
            }
            JobStatus newStatus = ((JobExecutionStatusEvent) event).newStatus();
            JobStatus status;
            if (newStatus == JobStatus.CREATED || newStatus == JobStatus.RUNNING) {
                replaced = false;
                return;
            } else if (newStatus == JobStatus.CANCELLING) {
                if (cancelledToRestart()) {
                    replaced = true;
                    LOG.info(
                            "Job {}'s execution graph is cancelled for a restart (the adaptive"
                                    + " scheduler's Restarting state): not an end, jobreg keeps"
                                    + " the job live.",
                            event.jobId());
                    return;
                }
                // A user's cancel: irrevocable from here (see the class's javadoc).
                status = JobStatus.CANCELED;
            } else if (newStatus != null && newStatus.isGloballyTerminalState()) {
                if (replaced) {
                    LOG.info(
                            "Job {}'s replaced execution graph reached {}: not the job's end.",
                            event.jobId(),
                            newStatus);
                    return;
                }
                status = newStatus;
            } else {
                return;
            }
            List<JobregBridge> bridges = JobregBridge.liveBridges(namespace);
            if (bridges.isEmpty()) {
                LOG.warn(
                        "No jobreg bridge of namespace {} in this JVM: the end of job {} is"
                                + " recorded by the Dispatcher's job result only.",
                        namespace,
                        event.jobId());
            }
            // Synchronously: the record is in the log before the execution graph moves on (to
            // CANCELED after CANCELLING) and before its termination future completes. A bridge
            // that does not lead answers NotLeader (only logged).
            for (JobregBridge bridge : bridges) {
                JobregJobTerminal.record(bridge, event.jobId(), status);
            }
        }
    }
}
