/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.EventOptions;
import org.apache.flink.events.Event;
import org.apache.flink.events.reporter.EventReporter;
import org.apache.flink.events.reporter.EventReporterFactory;
import org.apache.flink.metrics.MetricConfig;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Arrays;
import java.util.List;
import java.util.Properties;

/**
 * Records a job's end in jobreg from the <em>scheduler's</em> job status, which Flink 2.3's
 * JobMaster reports as a {@code JobStatusChangeEvent} (attribute {@code newJobStatus}) to every
 * event reporter ({@code events.reporter.<name>.factory.class}), synchronously on the JobMaster's
 * main thread, from the {@code JobStatusListener} it hands its scheduler.
 *
 * <p>That status is the job's, not an execution graph's. The default scheduler reports its one
 * graph's status (CANCELLING only from {@code SchedulerBase.cancel()}). The adaptive scheduler
 * reports its state's ({@code AdaptiveScheduler.transitionToState} notifies after the new state
 * is built): {@code Canceling} is the only state whose status is CANCELLING ({@code Restarting}
 * is RESTARTING, {@code Failing} FAILING), and {@code Finished} carries the job's globally
 * terminal status. So CANCELLING here is a user's cancel under both schedulers, recorded as
 * CANCELED, including the one case the execution graph's listener cannot see: a cancel while the
 * adaptive scheduler is {@code Restarting}, whose graph is already cancelled (it moves to {@code
 * Canceling} with no graph transition, and then to {@code Finished}, which logs "reached
 * terminal state CANCELED", in a later main-thread task: this record comes first). A globally
 * terminal status (CANCELED, FAILED, FINISHED) is recorded too (idempotent); SUSPENDED and the
 * rest are not ends.
 *
 * <p>Flink finds event reporter factories with Java's {@code ServiceLoader} (this jar's {@code
 * META-INF/services/org.apache.flink.events.reporter.EventReporterFactory}), then picks the one
 * named by {@code factory.class}. {@link JobregHaServicesFactory} adds this reporter as {@code events.reporter.jobreg} where
 * the configuration can be changed (the standalone entrypoints build their high-availability
 * services before their metric registry); set {@code
 * events.reporter.jobreg.factory.class: org.jobreg.flink.JobregJobStatusEventReporterFactory}
 * to be sure (and add {@code jobreg} to {@code events.reporters} if that list is set).
 */
public class JobregJobStatusEventReporterFactory implements EventReporterFactory {

    private static final Logger LOG =
            LoggerFactory.getLogger(JobregJobStatusEventReporterFactory.class);

    /** The reporter's name in the configuration. */
    static final String NAME = "jobreg";

    /** The reporter's property naming the jobreg namespace (set by {@link #register}). */
    static final String NAMESPACE = "namespace";

    /** The JobMaster's event of a scheduler's job status change (Flink 2.3's {@code Events}). */
    static final String EVENT = "JobStatusChangeEvent";

    /** Flink instantiates the factory reflectively. */
    public JobregJobStatusEventReporterFactory() {}

    @Override
    public EventReporter createEventReporter(Properties properties) {
        String namespace = properties.getProperty(NAMESPACE);
        return new Reporter(namespace == null || namespace.isBlank() ? null : namespace);
    }

    /**
     * Adds this reporter as {@code events.reporter.jobreg} (with the namespace) unless a reporter
     * of that name is configured, and to {@code events.reporters} if that list is set.
     */
    static void register(Configuration configuration) {
        String prefix = "events.reporter." + NAME + ".";
        String factoryKey = prefix + EventOptions.REPORTER_FACTORY_CLASS.key();
        boolean added = false;
        try {
            if (!configuration.containsKey(factoryKey)) {
                configuration.setString(
                        factoryKey, JobregJobStatusEventReporterFactory.class.getName());
                configuration.setString(
                        prefix + NAMESPACE, JobregHaOptions.namespace(configuration));
                added = true;
            }
            String reporters = configuration.get(EventOptions.REPORTERS_LIST);
            if (reporters != null && !reporters.isBlank()) {
                List<String> names = Arrays.asList(reporters.trim().split("\\s*,\\s*"));
                if (!names.contains(NAME)) {
                    configuration.set(EventOptions.REPORTERS_LIST, reporters + "," + NAME);
                    added = true;
                }
            }
        } catch (UnsupportedOperationException e) {
            // MiniCluster hands out an unmodifiable configuration.
            LOG.warn(
                    "Cannot add the event reporter {} (the configuration is unmodifiable): set"
                            + " {} to {}, or a user's cancel during a restart of the adaptive"
                            + " scheduler is recorded late.",
                    NAME,
                    factoryKey,
                    JobregJobStatusEventReporterFactory.class.getName());
            return;
        }
        if (added) {
            LOG.info(
                    "Added the event reporter {}: jobreg records a job's end from its scheduler.",
                    NAME);
        }
    }

    private static final class Reporter implements EventReporter {

        private final String namespace;

        Reporter(String namespace) {
            this.namespace = namespace;
        }

        @Override
        public void open(MetricConfig config) {}

        @Override
        public void close() {}

        @Override
        public void notifyOfAddedEvent(Event event) {
            if (!EVENT.equals(event.getName())) {
                return;
            }
            Object newStatus = event.getAttributes().get("newJobStatus");
            Object job = event.getAttributes().get("<job_id>");
            if (newStatus == null || job == null) {
                return;
            }
            JobStatus reached;
            try {
                reached = JobStatus.valueOf(newStatus.toString());
            } catch (IllegalArgumentException e) {
                return;
            }
            JobStatus status;
            if (reached == JobStatus.CANCELLING) {
                status = JobStatus.CANCELED; // a user's cancel (see the class's javadoc)
                LOG.info("Job {} is CANCELLING in its scheduler: a user's cancel.", job);
            } else if (reached.isGloballyTerminalState()) {
                status = reached;
            } else {
                return;
            }
            JobID jobId;
            try {
                jobId = JobID.fromHexString(job.toString());
            } catch (IllegalArgumentException e) {
                return;
            }
            List<JobregBridge> bridges =
                    namespace == null
                            ? JobregBridge.liveBridges()
                            : JobregBridge.liveBridges(namespace);
            // Synchronously, on the JobMaster's main thread: before the scheduler moves on.
            for (JobregBridge bridge : bridges) {
                JobregJobTerminal.record(bridge, jobId, status);
            }
        }
    }
}
