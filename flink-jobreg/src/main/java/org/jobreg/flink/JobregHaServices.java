/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.blob.BlobStoreService;
import org.apache.flink.runtime.checkpoint.CheckpointRecoveryFactory;
import org.apache.flink.runtime.highavailability.AbstractHaServices;
import org.apache.flink.runtime.highavailability.ApplicationResultStore;
import org.apache.flink.runtime.jobmanager.ApplicationStore;
import org.apache.flink.runtime.jobmanager.ApplicationStoreEntry;
import org.apache.flink.runtime.jobmanager.DefaultApplicationStore;
import org.apache.flink.runtime.jobmanager.DefaultExecutionPlanStore;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStore;
import org.apache.flink.runtime.jobmanager.NoOpExecutionPlanStoreWatcher;
import org.apache.flink.runtime.leaderretrieval.DefaultLeaderRetrievalService;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalService;
import org.apache.flink.runtime.util.ZooKeeperUtils;
import org.apache.flink.streaming.api.graph.ExecutionPlan;

import java.util.concurrent.Executor;

/**
 * Flink's high-availability services on jobreg: leader election and retrieval, execution plans,
 * applications, checkpoint pointers and counters, and job results all live in jobreg's fenced log,
 * reached through one {@link JobregBridge} child process that these services own. Payloads
 * (execution plans, checkpoint metadata, blobs) are files under {@code
 * high-availability.storageDir}; the log holds their pointers. Application results use Flink's
 * {@code FileSystemApplicationResultStore} (the bridge protocol has no application results),
 * completed by those jobreg's earlier record of a job's end implies ({@link
 * JobregApplicationResultStore}).
 */
public class JobregHaServices extends AbstractHaServices {

    private static final String RESOURCE_MANAGER = "resource_manager";
    private static final String DISPATCHER = "dispatcher";
    private static final String REST_SERVER = "rest_server";
    private static final String JOB_MANAGER_PREFIX = "job-";

    /** jobreg's store of execution plans. */
    public static final String PLANS = "plans";

    /** jobreg's store of applications. */
    public static final String APPLICATIONS = "applications";

    private final JobregBridge bridge;

    public JobregHaServices(
            Configuration configuration,
            Executor ioExecutor,
            BlobStoreService blobStoreService,
            JobregBridge bridge,
            ApplicationResultStore applicationResultStore) {
        this(
                configuration,
                ioExecutor,
                blobStoreService,
                bridge,
                new JobregJobResultStore(bridge, ioExecutor),
                applicationResultStore);
    }

    private JobregHaServices(
            Configuration configuration,
            Executor ioExecutor,
            BlobStoreService blobStoreService,
            JobregBridge bridge,
            JobregJobResultStore jobResultStore,
            ApplicationResultStore applicationResultStore) {
        super(
                configuration,
                new JobregLeaderElectionDriverFactory(bridge),
                ioExecutor,
                blobStoreService,
                jobResultStore,
                new JobregApplicationResultStore(applicationResultStore, jobResultStore));
        this.bridge = bridge;
    }

    /** The bridge these services own (tests pause or kill it). */
    public JobregBridge getBridge() {
        return bridge;
    }

    @Override
    protected LeaderRetrievalService createLeaderRetrievalService(String componentId) {
        return new DefaultLeaderRetrievalService(
                new JobregLeaderRetrievalDriverFactory(bridge, componentId));
    }

    @Override
    protected CheckpointRecoveryFactory createCheckpointRecoveryFactory() {
        return new JobregCheckpointRecoveryFactory(bridge, configuration, ioExecutor);
    }

    @Override
    protected ExecutionPlanStore createExecutionPlanStore() throws Exception {
        JobregStateHandleStore<ExecutionPlan> store =
                new JobregStateHandleStore<>(
                        bridge,
                        PLANS,
                        ZooKeeperUtils.createFileSystemStateStorage(
                                configuration,
                                ZooKeeperUtils.HA_STORAGE_SUBMITTED_EXECUTION_PLAN_PREFIX));
        // Kubernetes' choice too: no watcher; a standby learns of plans when it becomes leader.
        // A plan that cannot be recovered fails its job alone (JobregExecutionPlanStore).
        return new JobregExecutionPlanStore(
                new DefaultExecutionPlanStore<>(
                        store,
                        NoOpExecutionPlanStoreWatcher.INSTANCE,
                        JobregStoreUtils.EXECUTION_PLANS),
                bridge);
    }

    @Override
    protected ApplicationStore createApplicationStore() throws Exception {
        JobregStateHandleStore<ApplicationStoreEntry> store =
                new JobregStateHandleStore<>(
                        bridge,
                        APPLICATIONS,
                        ZooKeeperUtils.createFileSystemStateStorage(
                                configuration,
                                ZooKeeperUtils.HA_STORAGE_SUBMITTED_APPLICATION_PREFIX));
        return new DefaultApplicationStore<>(store, JobregStoreUtils.APPLICATIONS);
    }

    @Override
    protected void internalClose() {
        bridge.close();
    }

    @Override
    protected void internalCleanup() throws Exception {
        bridge.call(storeRequest("store_clear", PLANS));
        bridge.call(storeRequest("store_clear", APPLICATIONS));
    }

    @Override
    protected void internalCleanupJobData(JobID jobId) throws Exception {
        bridge.call(
                storeRequest(
                        "store_clear", JobregCheckpointRecoveryFactory.checkpointStoreName(jobId)));
    }

    private static org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode
            storeRequest(String op, String store) {
        org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode request =
                JobregBridge.request(op);
        request.put("store", store);
        return request;
    }

    @Override
    protected String getLeaderPathForResourceManager() {
        return RESOURCE_MANAGER;
    }

    @Override
    protected String getLeaderPathForDispatcher() {
        return DISPATCHER;
    }

    @Override
    protected String getLeaderPathForJobManager(JobID jobId) {
        return JOB_MANAGER_PREFIX + jobId.toHexString();
    }

    @Override
    protected String getLeaderPathForRestServer() {
        return REST_SERVER;
    }

    /** The component id of the REST server (also used by the client services). */
    static String restServerComponent() {
        return REST_SERVER;
    }
}
