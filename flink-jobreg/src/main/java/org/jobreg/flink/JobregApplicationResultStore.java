/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.ApplicationID;
import org.apache.flink.api.common.ApplicationState;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.highavailability.ApplicationResult;
import org.apache.flink.runtime.highavailability.ApplicationResultEntry;
import org.apache.flink.runtime.highavailability.ApplicationResultStore;
import org.apache.flink.runtime.highavailability.JobResultStore;
import org.apache.flink.runtime.jobmaster.JobResult;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Flink's application results ({@code FileSystemApplicationResultStore}, the delegate), completed
 * by the application results that jobreg's earlier record of a job's end implies.
 *
 * <p>jobreg records a job's end as its execution graph enters CANCELLING (or reaches a terminal
 * state), before Flink's Dispatcher writes the job's result and, after it, its application's
 * result. A JobManager killed in between leaves a dirty job result (jobreg's) with no application
 * result. Flink 2.3's Dispatcher requires every recovered dirty job result to belong to a
 * recovered application or to a dirty application result ({@code Dispatcher.onStart}: {@code
 * checkState(recoveredDirtyJobResultsByApplicationId.isEmpty())}), and a session-mode job's
 * {@code SingleJobApplication} is not in the application store: the next leader would end with an
 * {@code IllegalStateException}, and every leader after it. Flink's ZooKeeper backend meets the
 * same check when killed between the two writes. So {@link #getDirtyResults()} adds, for each
 * application of jobreg's dirty job results that the delegate knows nothing of, a dirty
 * application result in the job's terminal state; the Dispatcher then cleans the jobs up, and
 * marking that application result clean writes it to the delegate, dirty then clean, as Flink
 * would have.
 */
final class JobregApplicationResultStore implements ApplicationResultStore {

    private static final Logger LOG = LoggerFactory.getLogger(JobregApplicationResultStore.class);

    private final ApplicationResultStore delegate;
    private final JobResultStore jobResults;

    /** The application results implied by jobreg's dirty job results, not in the delegate. */
    private final Map<ApplicationID, ApplicationResult> implied = new ConcurrentHashMap<>();

    JobregApplicationResultStore(ApplicationResultStore delegate, JobResultStore jobResults) {
        this.delegate = delegate;
        this.jobResults = jobResults;
    }

    @Override
    public CompletableFuture<Void> createDirtyResultAsync(ApplicationResultEntry entry) {
        implied.remove(entry.getApplicationId());
        return delegate.createDirtyResultAsync(entry);
    }

    @Override
    public CompletableFuture<Void> markResultAsCleanAsync(ApplicationID applicationId) {
        ApplicationResult result = implied.remove(applicationId);
        if (result == null) {
            return delegate.markResultAsCleanAsync(applicationId);
        }
        return delegate.hasApplicationResultEntryAsync(applicationId)
                .thenCompose(
                        known ->
                                known
                                        ? CompletableFuture.<Void>completedFuture(null)
                                        : delegate.createDirtyResultAsync(
                                                new ApplicationResultEntry(result)))
                .thenCompose(ignored -> delegate.markResultAsCleanAsync(applicationId));
    }

    @Override
    public CompletableFuture<Boolean> hasDirtyApplicationResultEntryAsync(
            ApplicationID applicationId) {
        if (implied.containsKey(applicationId)) {
            return CompletableFuture.completedFuture(true);
        }
        return delegate.hasDirtyApplicationResultEntryAsync(applicationId);
    }

    @Override
    public CompletableFuture<Boolean> hasCleanApplicationResultEntryAsync(
            ApplicationID applicationId) {
        return delegate.hasCleanApplicationResultEntryAsync(applicationId);
    }

    @Override
    public Set<ApplicationResult> getDirtyResults() throws IOException {
        Set<ApplicationResult> results = new HashSet<>(delegate.getDirtyResults());
        Set<ApplicationID> known = new HashSet<>();
        for (ApplicationResult result : results) {
            known.add(result.getApplicationId());
        }
        Map<ApplicationID, JobResult> orphans = new HashMap<>();
        for (JobResult job : jobResults.getDirtyResults()) {
            job.getApplicationId()
                    .filter(id -> !known.contains(id))
                    .ifPresent(id -> orphans.putIfAbsent(id, job));
        }
        for (Map.Entry<ApplicationID, JobResult> orphan : orphans.entrySet()) {
            ApplicationID id = orphan.getKey();
            if (delegate.hasApplicationResultEntryAsync(id).join()) {
                continue; // clean there: the Dispatcher cleans the job up on its own
            }
            JobStatus status = orphan.getValue().getJobStatus().orElse(JobStatus.FAILED);
            ApplicationResult result =
                    new ApplicationResult.Builder()
                            .applicationId(id)
                            .applicationState(ApplicationState.fromJobStatus(status))
                            .applicationName("job " + orphan.getValue().getJobId())
                            .startTime(0)
                            .endTime(System.currentTimeMillis())
                            .build();
            implied.put(id, result);
            results.add(result);
            LOG.info(
                    "Application {} of job {}, which jobreg recorded as {} before Flink wrote its"
                            + " results, is given a dirty application result so that its job is"
                            + " cleaned up.",
                    id,
                    orphan.getValue().getJobId(),
                    status);
        }
        return results;
    }

    @Override
    public CompletableFuture<ApplicationResult> getCleanApplicationResultAsync(
            ApplicationID applicationId) {
        return delegate.getCleanApplicationResultAsync(applicationId);
    }
}
