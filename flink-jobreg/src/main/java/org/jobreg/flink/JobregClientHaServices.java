/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.runtime.highavailability.ClientHighAvailabilityServices;
import org.apache.flink.runtime.leaderretrieval.DefaultLeaderRetrievalService;
import org.apache.flink.runtime.leaderretrieval.LeaderRetrievalService;

/**
 * What Flink's REST client and CLI need: the REST endpoint's leader, read through a bridge that
 * never contends.
 */
public class JobregClientHaServices implements ClientHighAvailabilityServices {

    private final JobregBridge bridge;

    public JobregClientHaServices(JobregBridge bridge) {
        this.bridge = bridge;
    }

    @Override
    public LeaderRetrievalService getClusterRestEndpointLeaderRetriever() {
        return new DefaultLeaderRetrievalService(
                new JobregLeaderRetrievalDriverFactory(
                        bridge, JobregHaServices.restServerComponent()));
    }

    @Override
    public void close() {
        bridge.close();
    }
}
