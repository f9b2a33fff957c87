/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.runtime.leaderelection.LeaderElectionDriver;
import org.apache.flink.runtime.leaderelection.LeaderElectionDriverFactory;

/** Creates {@link JobregLeaderElectionDriver}s over one HA-services instance's bridge. */
public class JobregLeaderElectionDriverFactory implements LeaderElectionDriverFactory {

    private final JobregBridge bridge;

    public JobregLeaderElectionDriverFactory(JobregBridge bridge) {
        this.bridge = bridge;
    }

    @Override
    public LeaderElectionDriver create(LeaderElectionDriver.Listener listener) throws Exception {
        return new JobregLeaderElectionDriver(bridge, listener);
    }
}
