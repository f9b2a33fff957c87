/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.ApplicationID;
import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStoreUtil;
import org.apache.flink.runtime.jobmanager.ApplicationStoreUtil;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStoreUtil;

/**
 * The names of entries in jobreg's stores: a job's or an application's hex id, a checkpoint's id
 * as {@code /%019d} (the form ZooKeeper's backend uses, so names sort by id).
 */
public final class JobregStoreUtils {

    /** Execution plans: the JobID in hex. */
    public static final ExecutionPlanStoreUtil EXECUTION_PLANS =
            new ExecutionPlanStoreUtil() {
                @Override
                public String jobIDToName(JobID jobId) {
                    return jobId.toHexString();
                }

                @Override
                public JobID nameToJobID(String name) {
                    return JobID.fromHexString(name);
                }
            };

    /** Applications: the ApplicationID in hex. */
    public static final ApplicationStoreUtil APPLICATIONS =
            new ApplicationStoreUtil() {
                @Override
                public String applicationIdToName(ApplicationID applicationId) {
                    return applicationId.toHexString();
                }

                @Override
                public ApplicationID nameToApplicationId(String name) {
                    return ApplicationID.fromHexString(name);
                }
            };

    /** Checkpoints: {@code /%019d} of the checkpoint id. */
    public static final CheckpointStoreUtil CHECKPOINTS =
            new CheckpointStoreUtil() {
                @Override
                public String checkpointIDToName(long checkpointId) {
                    return String.format("/%019d", checkpointId);
                }

                @Override
                public long nameToCheckpointID(String name) {
                    try {
                        return Long.parseLong(name.startsWith("/") ? name.substring(1) : name);
                    } catch (NumberFormatException e) {
                        return INVALID_CHECKPOINT_ID;
                    }
                }
            };

    private JobregStoreUtils() {}
}
