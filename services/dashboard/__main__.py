from services.dashboard.service import main

main()
