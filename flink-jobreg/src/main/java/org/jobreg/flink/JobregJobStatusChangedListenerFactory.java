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
 * Records a job's globally terminal status in jobreg at the moment Flink's execution graph reaches
 * it (seed 001's window).
 *
 * <p>Flink 2.3's {@code DefaultExecutionGraph.transitionState} logs "switched from state CANCELLING
 * to CANCELED", then calls the {@link JobStatusChangedListener}s of {@code
 * execution.job-status-changed-listeners} synchronously, and only afterwards completes the graph's
 * termination future, from which the JobMaster tells the Dispatcher, which then writes its dirty
 * job result. The checkpoint services' shutdown with the terminal status runs even later (when the
 * scheduler closes, after the Dispatcher's write). So this listener is the earliest point at which
 * the registry can learn that a job ended. {@link JobregHaServicesFactory} adds it to the
 * JobManager's configuration where that configuration can be changed (the standalone
 * entrypoints); set {@code execution.job-status-changed-listeners:
 * org.jobreg.flink.JobregJobStatusChangedListenerFactory} to be sure.
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

    private static final class Listener implements JobStatusChangedListener {

        private final String namespace;

        Listener(String namespace) {
            this.namespace = namespace;
        }

        @Override
        public void onEvent(JobStatusChangedEvent event) {
            if (!(event instanceof JobExecutionStatusEvent)) {
                return;
            }
            JobStatus status = ((JobExecutionStatusEvent) event).newStatus();
            if (status == null || !status.isGloballyTerminalState()) {
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
            // Synchronously: the record is in the log before the execution graph's termination
            // future completes. A bridge that does not lead answers NotLeader (only logged).
            for (JobregBridge bridge : bridges) {
                JobregJobTerminal.record(bridge, event.jobId(), status);
            }
        }
    }
}
