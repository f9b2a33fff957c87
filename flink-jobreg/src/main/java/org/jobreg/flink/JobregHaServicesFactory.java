/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.blob.BlobStoreService;
import org.apache.flink.runtime.blob.BlobUtils;
import org.apache.flink.runtime.highavailability.ClientHighAvailabilityServices;
import org.apache.flink.runtime.highavailability.FileSystemApplicationResultStore;
import org.apache.flink.runtime.highavailability.HighAvailabilityServices;
import org.apache.flink.runtime.highavailability.HighAvailabilityServicesFactory;

import java.util.concurrent.Executor;

/**
 * Flink's entry point to high availability on jobreg. Configure {@code high-availability.type:
 * org.jobreg.flink.JobregHaServicesFactory} with {@code high-availability.jobreg.bootstrap} and
 * {@code high-availability.storageDir}, and put this jar in Flink's {@code lib/} (Flink loads the
 * factory from the system class path, not as a plugin).
 */
public class JobregHaServicesFactory implements HighAvailabilityServicesFactory {

    /** Flink instantiates the factory reflectively. */
    public JobregHaServicesFactory() {}

    @Override
    public HighAvailabilityServices createHAServices(
            Configuration configuration, Executor executor) throws Exception {
        JobregHaOptions.checkStorageDir(configuration);
        // The JobManager's components read this same configuration afterwards.
        JobregJobStatusChangedListenerFactory.register(configuration);
        JobregJobStatusEventReporterFactory.register(configuration);
        BlobStoreService blobStoreService = BlobUtils.createBlobStoreFromConfig(configuration);
        JobregBridge bridge = JobregBridge.start(configuration);
        try {
            return new JobregHaServices(
                    configuration,
                    executor,
                    blobStoreService,
                    bridge,
                    FileSystemApplicationResultStore.fromConfiguration(configuration, executor));
        } catch (Exception e) {
            bridge.close();
            blobStoreService.close();
            throw e;
        }
    }

    @Override
    public ClientHighAvailabilityServices createClientHAServices(Configuration configuration)
            throws Exception {
        return new JobregClientHaServices(JobregBridge.start(configuration));
    }
}
