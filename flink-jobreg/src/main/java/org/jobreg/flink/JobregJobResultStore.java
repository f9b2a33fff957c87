/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.ApplicationID;
import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.highavailability.AbstractThreadsafeJobResultStore;
import org.apache.flink.runtime.highavailability.JobResultEntry;
import org.apache.flink.runtime.jobmaster.JobResult;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.IOException;
import java.util.HashSet;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.concurrent.Executor;

/**
 * Flink's {@code JobResultStore} in jobreg's log: a dirty result is a job's end recorded in the
 * fold, a clean one its cleanup (fold rule 5). A job whose end {@code job_terminal} already
 * recorded has a dirty result, so a new leader cleans it up instead of running it again.
 *
 * <p>jobreg keeps the final status only: {@link #getDirtyResults()} gives results with the job id
 * and its status, without accumulators, failure cause or runtime, and with the job's id as its
 * application's id (right for jobs submitted on their own, each a SingleJobApplication; not for
 * the jobs of a multi-job application).
 */
public class JobregJobResultStore extends AbstractThreadsafeJobResultStore {

    private final JobregBridge bridge;

    public JobregJobResultStore(JobregBridge bridge, Executor ioExecutor) {
        super(ioExecutor);
        this.bridge = bridge;
    }

    private JsonNode call(ObjectNode request) throws IOException {
        try {
            return bridge.callUninterruptibly(request);
        } catch (JobregBridgeException e) {
            throw new IOException(e.getMessage(), e);
        }
    }

    private static ObjectNode request(String op, JobID jobId) {
        ObjectNode request = JobregBridge.request(op);
        request.put("job", jobId.toHexString());
        return request;
    }

    @Override
    protected void createDirtyResultInternal(JobResultEntry jobResultEntry) throws IOException {
        JobResult result = jobResultEntry.getJobResult();
        ObjectNode request = request("result_create", jobResultEntry.getJobId());
        request.put("status", statusOf(result).name());
        try {
            bridge.callUninterruptibly(request);
        } catch (JobregBridgeException e) {
            if (JobregBridgeException.ALREADY_EXISTS.equals(e.getKind())) {
                throw new IllegalStateException(
                        "A job result of "
                                + jobResultEntry.getJobId()
                                + " exists: "
                                + e.getMessage());
            }
            throw new IOException(e.getMessage(), e);
        }
    }

    private static JobStatus statusOf(JobResult result) {
        // A result without a status is one whose end Flink could not tell: failed.
        return result.getJobStatus().orElse(JobStatus.FAILED);
    }

    @Override
    protected void markResultAsCleanInternal(JobID jobId)
            throws IOException, NoSuchElementException {
        try {
            bridge.callUninterruptibly(request("result_clean", jobId));
        } catch (JobregBridgeException e) {
            if (JobregBridgeException.NOT_EXIST.equals(e.getKind())) {
                throw new NoSuchElementException(
                        "No job result of " + jobId + " in jobreg: " + e.getMessage());
            }
            throw new IOException(e.getMessage(), e);
        }
    }

    @Override
    protected boolean hasDirtyJobResultEntryInternal(JobID jobId) throws IOException {
        return call(request("result_has", jobId)).path("dirty").asBoolean(false);
    }

    @Override
    protected boolean hasCleanJobResultEntryInternal(JobID jobId) throws IOException {
        return call(request("result_has", jobId)).path("clean").asBoolean(false);
    }

    @Override
    protected Set<JobResult> getDirtyResultsInternal() throws IOException {
        Set<JobResult> results = new HashSet<>();
        for (JsonNode entry : call(JobregBridge.request("results_dirty"))) {
            JobStatus status = JobStatus.valueOf(entry.path("status").asText("FAILED"));
            String job = entry.path("job").asText();
            results.add(
                    new JobResult.Builder()
                            .jobId(JobID.fromHexString(job))
                            // Flink 2.3's Dispatcher refuses a recovered result without an
                            // application. jobreg does not keep it; a job submitted on its own
                            // runs as a SingleJobApplication whose id is the job's id.
                            .applicationId(ApplicationID.fromHexString(job))
                            .jobStatus(status)
                            .netRuntime(0)
                            .build());
        }
        return results;
    }
}
