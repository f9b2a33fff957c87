/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalDriver;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalDriverFactory;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalEventHandler;
import org.apache.flink.runtime.rpc.FatalErrorHandler;

/** Creates {@link JobregLeaderRetrievalDriver}s for one component. */
public class JobregLeaderRetrievalDriverFactory implements LeaderRetrievalDriverFactory {

    private final JobregBridge bridge;
    private final String componentId;

    public JobregLeaderRetrievalDriverFactory(JobregBridge bridge, String componentId) {
        this.bridge = bridge;
        this.componentId = componentId;
    }

    @Override
    public LeaderRetrievalDriver createLeaderRetrievalDriver(
            LeaderRetrievalEventHandler leaderEventHandler, FatalErrorHandler fatalErrorHandler)
            throws Exception {
        return new JobregLeaderRetrievalDriver(
                bridge, componentId, leaderEventHandler, fatalErrorHandler);
    }
}
